/* The batch-invariant forward product (ops_set_batch_invariant).
 *
 * Why: OpenBLAS's sgemm picks its microkernels by the shape of the call, so one row of
 * x @ W^T gets different bits when the call has 1, 5 or 300 rows (edge kernels for the
 * row remainder; sgemv for one row). The rollout engine decodes with as many rows as
 * sequences are running and the trainer scores the same tokens in packed batches, so the
 * two disagree in the last bits. Here every element is defined by its own operands only:
 *
 *   c[i, j] += alpha * cpu_dot(row i of op(A), column j of op(B), k)
 *
 * cpu_dot's order (cpu.h): DOT_LANES = 8 partial sums over k (lane l takes k = l mod 8
 * of the whole 8-blocks, in increasing k), combined pairwise ((0+4)+(1+5))+((2+6)+(3+7)),
 * then the tail k mod 8 summed in order and added last. Multiplies and adds round
 * separately (no fused multiply-add: -std=c11 turns contraction off, and no clone below
 * enables FMA), so the vector code gives the scalar definition's bits exactly, on any
 * x86-64 (SSE2 or AVX2) and at any thread count: threads only split which elements each
 * computes.
 *
 * Speed comes from register blocking: a micro-tile of 4 rows of A x 3 rows of B keeps
 * one 8-lane accumulator per element in a register (12 of the 16 AVX2 registers) and
 * loads each operand vector once per 8 values of k; the rows left over go in 3 x 3,
 * 2 x 4 and 1 x 8 tiles (a decode step's one row reads 8 rows of W at a time). Which
 * tile computes an element never changes its order. Both operands are read along k
 * ("dot" form), so the usual linear layer (x [M, K] @ W^T, W [N, K]) needs no repacking;
 * a transposed A or a non-transposed B is first copied into that form. Tiles of
 * 64 x 48 elements are the unit of the OpenMP split; within one, a group of 4 rows of A
 * stays in L1 while the tile's rows of B stream past it from L2.
 *
 * Measured (one thread, 2-core Zen 3 VM, AVX2; kernels/README.md): about 1.6x
 * OpenBLAS's time on 2048-row products, at par or faster on decode shapes (1-64 rows),
 * where the BLAS's packing does not pay. Without AVX2 (the default clone, SSE2) it runs
 * about 3x slower, with the same bits. K far beyond 1024 leaves a 4-row
 * group larger than L1 (the kernel does not block k, which would need the accumulators
 * kept across blocks): slower, still exact. */
#include "kernels/cpu/cpu.h" /* defines: cpu_gemm_invariant, cpu_set_batch_invariant */

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(DOT_LANES == 8, "the vector kernel below is cpu_dot's 8 lanes");

static atomic_bool invariant_on;

int cpu_set_batch_invariant(bool on, struct smelt_error *err) {
    (void)err;
    atomic_store(&invariant_on, on);
    return SMELT_OK;
}

bool cpu_batch_invariant(void) { return atomic_load_explicit(&invariant_on, memory_order_relaxed); }

/* ---- the micro-tile ---- */

#define MR 4          /* rows of A in a full micro-tile */
#define NR 3          /* rows of B in a full micro-tile: 12 accumulators, 3 B vectors */
#define NR_MAX 8      /* most rows of B in a micro-tile (the one-row remainder) */
#define TILE_ROWS 64  /* rows of op(A) per parallel tile (a multiple of MR) */
#define TILE_COLS 48  /* columns of C per parallel tile (a multiple of 3, 4 and 8) */
#define PARALLEL_MIN (1 << 18) /* multiply-adds below which threads cost more than they save */

typedef float v8 __attribute__((vector_size(DOT_LANES * sizeof(float))));

#define INLINE static inline __attribute__((always_inline))

/* Vectors are never passed by value to a function (their ABI differs between the
 * AVX2 clone and the default build): loads are memcpy (unaligned), sums take a pointer. */
#define LOAD8(dst, p) memcpy(&(dst), (p), sizeof(v8))

/* The lanes combined as cpu_dot combines them. */
INLINE float lanes_sum(const v8 *v) {
    const v8 s = *v;
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

/* lanes_sum of four accumulators at once, in the same order: first x_i = s_i + s_(i+4)
 * for all four (halves of two accumulators side by side), then x0 + x1 and x2 + x3,
 * then their sum. */
/* Lanes of two vectors picked by index (0-7 the first's, 8-15 the second's): GCC's and
 * clang's builtins for the same shuffle. */
#if defined(__clang__)
#define SHUFFLE8(a, b, ...) __builtin_shufflevector((a), (b), __VA_ARGS__)
#else
typedef int32_t v8i __attribute__((vector_size(DOT_LANES * sizeof(int32_t))));
#define SHUFFLE8(a, b, ...) __builtin_shuffle((a), (b), (v8i){__VA_ARGS__})
#endif
#define LO 0, 1, 2, 3, 8, 9, 10, 11
#define HI 4, 5, 6, 7, 12, 13, 14, 15

INLINE void lanes_sum4(const v8 *a0, const v8 *a1, const v8 *a2, const v8 *a3, float *out) {
    v8 t0 = SHUFFLE8(*a0, *a1, LO) + SHUFFLE8(*a0, *a1, HI); /* x(a0) | x(a1) */
    v8 t1 = SHUFFLE8(*a2, *a3, LO) + SHUFFLE8(*a2, *a3, HI); /* x(a2) | x(a3) */
    /* u: a0 (x0+x1, x2+x3), a2 (..), a1 (..), a3 (..) */
    v8 u = SHUFFLE8(t0, t1, 0, 2, 8, 10, 4, 6, 12, 14) + SHUFFLE8(t0, t1, 1, 3, 9, 11, 5, 7, 13, 15);
    out[0] = u[0] + u[1];
    out[1] = u[4] + u[5];
    out[2] = u[2] + u[3];
    out[3] = u[6] + u[7];
}

/* The operands of one product in dot form: row i of op(A) at a + i * lda, column j of
 * op(B) at b + j * ldb, each k long and contiguous. */
struct dot_operands {
    const float *a, *b;
    int64_t lda, ldb, k;
    float alpha;
    float *c;
    int64_t ldc;
};

/* c[r, q] += alpha * cpu_dot(a_r, b_q) for r < ROWS, q < COLS, starting at row i and
 * column j. Called with constant ROWS and COLS, so the accumulators live in registers. */
INLINE void micro_tile(const struct dot_operands *o, int64_t i, int64_t j, const int ROWS, const int COLS) {
    const float *a = o->a + i * o->lda, *b = o->b + j * o->ldb;
    const int64_t lda = o->lda, ldb = o->ldb, k = o->k;
    v8 acc[MR][NR_MAX];
#pragma GCC unroll 4
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 8
        for (int q = 0; q < COLS; q++) acc[r][q] = (v8){0};
    int64_t kk = 0;
    for (; kk + DOT_LANES <= k; kk += DOT_LANES) {
        v8 bv[NR_MAX];
#pragma GCC unroll 8
        for (int q = 0; q < COLS; q++) LOAD8(bv[q], b + q * ldb + kk);
#pragma GCC unroll 4
        for (int r = 0; r < ROWS; r++) {
            v8 av;
            LOAD8(av, a + r * lda + kk);
#pragma GCC unroll 8
            for (int q = 0; q < COLS; q++) acc[r][q] += av * bv[q];
        }
    }
    /* The lanes of every element summed, four elements at a time; then the tail. */
    float sum[MR * NR_MAX];
    int e = 0;
#pragma GCC unroll 8
    for (; e + 4 <= ROWS * COLS; e += 4)
        lanes_sum4(&acc[e / COLS][e % COLS], &acc[(e + 1) / COLS][(e + 1) % COLS],
                   &acc[(e + 2) / COLS][(e + 2) % COLS], &acc[(e + 3) / COLS][(e + 3) % COLS], sum + e);
    for (; e < ROWS * COLS; e++) sum[e] = lanes_sum(&acc[e / COLS][e % COLS]);
    for (int r = 0; r < ROWS; r++)
        for (int q = 0; q < COLS; q++) {
            float tail = 0.0f;
            for (int64_t t = kk; t < k; t++) tail += a[r * lda + t] * b[q * ldb + t];
            o->c[(i + r) * o->ldc + j + q] += o->alpha * (sum[r * COLS + q] + tail);
        }
}

/* Columns [j0, j1) of `rows` rows starting at i, in micro-tiles of `rows` x cols_step
 * and a narrower remainder. The widest step that fits the registers with the rows. */
#define SWEEP(ROWS, STEP)                                                                   \
    do {                                                                                    \
        int64_t j = j0;                                                                     \
        for (; j + (STEP) <= j1; j += (STEP)) micro_tile(o, i, j, ROWS, STEP);              \
        for (; j < j1; j++) micro_tile(o, i, j, ROWS, 1);                                   \
    } while (0)

/* One parallel tile: rows [i0, i1) x columns [j0, j1). Each group of MR rows of A stays
 * in L1 while the tile's columns of B stream past it. Compiled for AVX2 too where the
 * CPU has it (same bits: the same adds and multiplies, wider). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
static void run_tile(const struct dot_operands *o, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    int64_t i = i0;
    for (; i + MR <= i1; i += MR) SWEEP(MR, NR);
    switch (i1 - i) {
    case 3: SWEEP(3, 3); break;
    case 2: SWEEP(2, 4); break;
    case 1: SWEEP(1, 8); break;
    default: break;
    }
}

/* ---- the product ---- */

/* Every tile of one batch's product; threads split the tiles. */
static void run_product(const struct dot_operands *o, int64_t m, int64_t n) {
    int64_t row_tiles = (m + TILE_ROWS - 1) / TILE_ROWS, col_tiles = (n + TILE_COLS - 1) / TILE_COLS;
    int64_t tiles = row_tiles * col_tiles;
    /* Row tiles vary fastest: a thread's run of tiles shares its columns of B. */
#pragma omp parallel for schedule(static) if (m * n * o->k >= PARALLEL_MIN && tiles > 1)
    for (int64_t t = 0; t < tiles; t++) {
        int64_t ti = t % row_tiles, tj = t / row_tiles;
        int64_t i0 = ti * TILE_ROWS, j0 = tj * TILE_COLS;
        int64_t i1 = i0 + TILE_ROWS < m ? i0 + TILE_ROWS : m, j1 = j0 + TILE_COLS < n ? j0 + TILE_COLS : n;
        run_tile(o, i0, i1, j0, j1);
    }
}

/* dst [cols, rows] = src [rows, cols] with leading dimension ld: an operand read across
 * k turned into rows along k. */
static void transpose(float *dst, const float *src, int64_t rows, int64_t cols, int64_t ld) {
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
    for (int64_t c = 0; c < cols; c++)
        for (int64_t r = 0; r < rows; r++) dst[c * rows + r] = src[r * ld + c];
}

/* An operand in dot form for batch bi: its own memory when already laid out along k,
 * else a transposed copy in scratch (made once when the operand is shared by every
 * batch). */
static const float *dot_rows(const float *data, int64_t stride, int64_t ld, bool along_k, int64_t rows,
                             int64_t k, float *scratch, int64_t bi) {
    const float *mine = data + bi * stride;
    if (along_k) return mine;
    if (bi == 0 || stride != 0) transpose(scratch, mine, k, rows, ld); /* stored [k, rows] */
    return scratch;
}

/* k = 0: every dot product is cpu_dot's empty sum, +0 (operands may have no memory). */
static void add_empty_products(const struct cpu_gemm *g) {
    for (int64_t bi = 0; bi < g->batch; bi++)
        for (int64_t i = 0; i < g->m; i++)
            for (int64_t j = 0; j < g->n; j++) g->c[bi * g->c_stride + i * g->ldc + j] += g->alpha * 0.0f;
}

int cpu_gemm_invariant(const struct cpu_gemm *g, const char *op, struct smelt_error *err) {
    if (g->batch == 0 || g->m == 0 || g->n == 0) return SMELT_OK;
    if (g->k == 0) {
        add_empty_products(g);
        return SMELT_OK;
    }
    /* Dot form wants op(A) by rows (A not transposed) and op(B) by columns (B transposed). */
    bool a_along_k = !g->trans_a, b_along_k = g->trans_b;
    float *a_pack = NULL, *b_pack = NULL;
    if (!a_along_k) a_pack = malloc((size_t)(g->m * g->k) * sizeof *a_pack);
    if (!b_along_k) b_pack = malloc((size_t)(g->n * g->k) * sizeof *b_pack);
    if ((!a_along_k && !a_pack) || (!b_along_k && !b_pack)) {
        free(a_pack);
        free(b_pack);
        return error_set(err, SMELT_ENOMEM, "%s: cannot allocate the batch-invariant product's %lld x %lld repack",
                         op, (long long)(a_along_k ? g->n : g->m), (long long)g->k);
    }
    for (int64_t bi = 0; bi < g->batch; bi++) {
        struct dot_operands o = {
            .a = dot_rows(g->a, g->a_stride, g->lda, a_along_k, g->m, g->k, a_pack, bi),
            .b = dot_rows(g->b, g->b_stride, g->ldb, b_along_k, g->n, g->k, b_pack, bi),
            .lda = a_along_k ? g->lda : g->k, .ldb = b_along_k ? g->ldb : g->k, .k = g->k,
            .alpha = g->alpha, .c = g->c + bi * g->c_stride, .ldc = g->ldc,
        };
        run_product(&o, g->m, g->n);
    }
    free(a_pack);
    free(b_pack);
    return SMELT_OK;
}
