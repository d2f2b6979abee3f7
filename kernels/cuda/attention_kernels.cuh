/* The fused causal attention kernels (device code only; attention.cu launches them).
 * Kept apart from the launches so tests/emu/ can compile the same source with a host
 * compiler and run it on the CPU against kernels/cpu/attention.c, on machines with no GPU.
 *
 * Flash-attention style: the T x T score matrix never exists in device memory. A block
 * owns a tile of rows and streams the other side through shared memory in tiles of
 * ATTN_BK, keeping an online softmax (forward) or recomputing probabilities from the saved
 * lse (backward). Everything is accumulated in f32; bf16 storage is loaded with to_f32 and
 * each output element is rounded once.
 *
 * Thread layout, all three kernels: ATTN_THREADS = 16 x 8 threads; thread (ty, tx) owns
 * rows ty * R .. ty * R + R - 1 of its block's tile and, for every row, the columns
 * tx, tx + 8, tx + 16, ... of the other operand (keys, queries or head dims). The 8 threads
 * of a row are 8 consecutive lanes of one warp, so row reductions are three xor-shuffles.
 * Shared rows are padded to dim + 1 floats so the strided reads of a warp hit distinct
 * banks.
 *
 * Determinism: no atomics. Each output element has one writer, and every sum runs in an
 * order fixed by the shape, so results are bit-identical run to run.
 *
 * Host memory is never touched here: the tile lists are built on the host from cu_seqlens
 * and copied to the device by attention.cu. */
#ifndef SMELT_KERNELS_CUDA_ATTENTION_KERNELS_CUH
#define SMELT_KERNELS_CUDA_ATTENTION_KERNELS_CUH

#include "kernels/cuda/common.cuh"

#include <type_traits>

enum {
    ATTN_THREADS = 128,
    ATTN_TX = 8,                 /* threads per row */
    ATTN_TY = ATTN_THREADS / ATTN_TX,
    ATTN_BK = 32,                /* streamed tile: keys (forward, dq) or queries (dk/dv) */
    ATTN_PER_THREAD = ATTN_BK / ATTN_TX,
};

/* One block's work: rows [start, start + count) of the sequence that begins at token
 * seq_start and has seq_len tokens (row indices relative to the sequence). */
struct attn_tile {
    int32_t seq_start, seq_len, start, count;
};

struct attn_shape {
    int hq, hkv, dim;
    float scale;
};

/* Max and sum over the 8 lanes that share a row (lanes differ in their low three bits). */
__device__ __forceinline__ float attn_row_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
}

__device__ __forceinline__ float attn_row_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v + __shfl_xor_sync(0xffffffffu, v, 4);
}

/* rows x dim of a [tokens, heads, dim] tensor, starting at token `token` and head `head`,
 * into shared memory with row stride ld; rows at or past `valid` are zero. */
template <typename T>
__device__ __forceinline__ void attn_load_rows(float *dst, const T *src, int64_t token, int heads,
                                               int head, int rows, int valid, int dim, int ld) {
    for (int i = threadIdx.x; i < rows * dim; i += ATTN_THREADS) {
        int r = i / dim, c = i % dim;
        dst[r * ld + c] = r < valid ? to_f32(src[((token + r) * heads + head) * (int64_t)dim + c]) : 0.0f;
    }
}

/* Shared memory, in floats, of each kernel for head size dim (padded rows). */
__host__ __device__ inline int64_t attn_forward_shared_floats(int rows, int dim) {
    return (int64_t)(rows + 2 * ATTN_BK) * (dim + 1) + (int64_t)rows * (ATTN_BK + 1);
}
__host__ __device__ inline int64_t attn_dq_shared_floats(int rows, int dim) {
    return (int64_t)(2 * rows + 2 * ATTN_BK) * (dim + 1) + (int64_t)rows * (ATTN_BK + 1);
}
__host__ __device__ inline int64_t attn_dkv_shared_floats(int rows, int dim) {
    return (int64_t)(2 * rows + 2 * ATTN_BK) * (dim + 1) + 2 * (int64_t)rows * (ATTN_BK + 1) + 2 * ATTN_BK;
}

/* ---- host side: tiles, kernel choice, launches (shared with tests/emu/) ----------- */

/* Tiles of `rows` rows over every sequence of cu (S + 1 entries); empty sequences give
 * none. attn_tiles_fill writes attn_tile_count(...) entries. */
inline int64_t attn_tile_count(const int32_t *cu, int64_t nseq, int rows) {
    int64_t count = 0;
    for (int64_t s = 0; s < nseq; s++) count += ((int64_t)cu[s + 1] - cu[s] + rows - 1) / rows;
    return count;
}

inline void attn_tiles_fill(attn_tile *dst, const int32_t *cu, int64_t nseq, int rows) {
    int64_t n = 0;
    for (int64_t s = 0; s < nseq; s++) {
        int32_t len = cu[s + 1] - cu[s];
        for (int32_t start = 0; start < len; start += rows)
            dst[n++] = attn_tile{cu[s], len, start, len - start < rows ? len - start : rows};
    }
}

/* Calls f(DMAX, R) as integral constants for the smallest head-size bound DMAX in
 * {64, 128, 256} holding dim; R is the rows per thread of the forward and dq kernels
 * (the dk/dv kernel takes R / 2). A larger dim is SMELT_EUNSUPPORTED. */
template <typename F> int attn_with_head_bound(int dim, const char *op, struct smelt_error *err, F f) {
    if (dim <= 64) return f(std::integral_constant<int, 64>{}, std::integral_constant<int, 4>{});
    if (dim <= 128) return f(std::integral_constant<int, 128>{}, std::integral_constant<int, 4>{});
    if (dim <= 256) return f(std::integral_constant<int, 256>{}, std::integral_constant<int, 2>{});
    return error_set(err, SMELT_EUNSUPPORTED, "%s: head_dim %d is above 256, the largest the CUDA kernels take",
                     op, dim);
}

/* One kernel's launch configuration. attention.cu launches exactly this and tests/emu/
 * runs exactly this, so the emulator's grid, block and shared memory are the GPU's. */
struct attn_launch {
    dim3 grid;
    unsigned threads;
    size_t shared_bytes; /* dynamic shared memory */
};

/* Rows of one tile for a kernel with R rows per thread: the `rows` of attn_tile_count. */
constexpr int attn_tile_rows(int R) { return ATTN_TY * R; }

/* Tile kernels: one block per (tile, head); `tiles` is attn_tile_count(cu, nseq,
 * attn_tile_rows(R)). Forward and dq walk q heads, dk/dv kv heads (each block sums
 * the q heads of its group). */
inline attn_launch attn_forward_launch(int64_t tiles, const attn_shape &sh, int R) {
    size_t floats = (size_t)attn_forward_shared_floats(attn_tile_rows(R), sh.dim);
    return attn_launch{dim3{(unsigned)tiles, (unsigned)sh.hq, 1}, ATTN_THREADS, floats * sizeof(float)};
}
inline attn_launch attn_dq_launch(int64_t tiles, const attn_shape &sh, int R) {
    size_t floats = (size_t)attn_dq_shared_floats(attn_tile_rows(R), sh.dim);
    return attn_launch{dim3{(unsigned)tiles, (unsigned)sh.hq, 1}, ATTN_THREADS, floats * sizeof(float)};
}
inline attn_launch attn_dkv_launch(int64_t tiles, const attn_shape &sh, int R) {
    size_t floats = (size_t)attn_dkv_shared_floats(attn_tile_rows(R), sh.dim);
    return attn_launch{dim3{(unsigned)tiles, (unsigned)sh.hkv, 1}, ATTN_THREADS, floats * sizeof(float)};
}

/* delta over rows = tokens x q heads: one warp per row, grid-stride past the block cap. */
inline attn_launch attn_delta_launch(int64_t rows) {
    return attn_launch{dim3{cuda_blocks_for(rows, CUDA_THREADS / 32), 1, 1}, CUDA_THREADS, 0};
}

/* out[i][j] = rows[ty R + i] . cols[tx + 8 j] over dim: this thread's R rows of one
 * shared tile against its ATTN_PER_THREAD rows of another (scores q.k, or dout.v). */
template <int R>
__device__ __forceinline__ void attn_dots(float (&out)[R][ATTN_PER_THREAD], const float *rows, const float *cols,
                                          int ty, int tx, int dim, int ld) {
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int j = 0; j < ATTN_PER_THREAD; j++) out[i][j] = 0.0f;
    for (int c = 0; c < dim; c++) {
        float rv[R], cv[ATTN_PER_THREAD];
#pragma unroll
        for (int i = 0; i < R; i++) rv[i] = rows[(ty * R + i) * ld + c];
#pragma unroll
        for (int j = 0; j < ATTN_PER_THREAD; j++) cv[j] = cols[(tx + ATTN_TX * j) * ld + c];
#pragma unroll
        for (int i = 0; i < R; i++)
#pragma unroll
            for (int j = 0; j < ATTN_PER_THREAD; j++) out[i][j] = fmaf(rv[i], cv[j], out[i][j]);
    }
}

/* acc[i][c] += sum over j < n of w[(ty R + i) (ATTN_BK + 1) + j] * m[j ld + tx + 8c]: this thread's
 * rows of a [rows, ATTN_BK] weight tile (probabilities, or their gradients) times a
 * [ATTN_BK, dim] tile of shared rows (v, k, q or dout). */
template <int R, int COLS>
__device__ __forceinline__ void attn_add_product(float (&acc)[R][COLS], const float *w, const float *m, int n,
                                                 int ty, int tx, int dim, int ld) {
    for (int j = 0; j < n; j++) {
        float wj[R];
#pragma unroll
        for (int i = 0; i < R; i++) wj[i] = w[(ty * R + i) * (ATTN_BK + 1) + j];
#pragma unroll
        for (int c = 0; c < COLS; c++) {
            const int col = tx + ATTN_TX * c;
            if (col < dim) {
                const float mv = m[j * ld + col];
#pragma unroll
                for (int i = 0; i < R; i++) acc[i][c] = fmaf(wj[i], mv, acc[i][c]);
            }
        }
    }
}

/* ---- forward ---------------------------------------------------------------------- */

/* Block (tile, q head): R * 16 query rows against every key up to the tile's last query.
 * out [T, Hq, D], lse [T, Hq] (or NULL). DMAX >= dim bounds the per-thread accumulators. */
template <typename T, int DMAX, int R>
__global__ void __launch_bounds__(ATTN_THREADS)
attention_forward_kernel(T *out, float *lse, const T *__restrict__ q, const T *__restrict__ k,
                         const T *__restrict__ v, const attn_tile *__restrict__ tiles, attn_shape sh) {
    constexpr int ROWS = ATTN_TY * R, COLS = DMAX / ATTN_TX, PLD = ATTN_BK + 1;
    extern __shared__ float attn_shared[];
    const int dim = sh.dim, ld = dim + 1;
    float *sq = attn_shared, *sk = sq + ROWS * ld, *sv = sk + ATTN_BK * ld, *sp = sv + ATTN_BK * ld;
    const attn_tile tile = tiles[blockIdx.x];
    const int h = blockIdx.y, kvh = h / (sh.hq / sh.hkv);
    const int ty = threadIdx.x / ATTN_TX, tx = threadIdx.x % ATTN_TX;

    attn_load_rows(sq, q, (int64_t)tile.seq_start + tile.start, sh.hq, h, ROWS, tile.count, dim, ld);

    float acc[R][COLS], m[R], l[R];
#pragma unroll
    for (int i = 0; i < R; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int c = 0; c < COLS; c++) acc[i][c] = 0.0f;
    }

    const int last_query = tile.start + tile.count - 1;
    for (int k0 = 0; k0 <= last_query; k0 += ATTN_BK) {
        const int keys = min((int)ATTN_BK, tile.seq_len - k0);
        __syncthreads(); /* the previous tile's sk, sv, sp are no longer read */
        attn_load_rows(sk, k, (int64_t)tile.seq_start + k0, sh.hkv, kvh, ATTN_BK, keys, dim, ld);
        attn_load_rows(sv, v, (int64_t)tile.seq_start + k0, sh.hkv, kvh, ATTN_BK, keys, dim, ld);
        __syncthreads();

        float s[R][ATTN_PER_THREAD];
        attn_dots(s, sq, sk, ty, tx, dim, ld);

#pragma unroll
        for (int i = 0; i < R; i++) {
            const int query = tile.start + ty * R + i;
            float tile_max = -INFINITY;
#pragma unroll
            for (int j = 0; j < ATTN_PER_THREAD; j++) {
                const int key = k0 + tx + ATTN_TX * j;
                s[i][j] = key <= query && key < tile.seq_len ? s[i][j] * sh.scale : -INFINITY;
                tile_max = fmaxf(tile_max, s[i][j]);
            }
            const float m_new = fmaxf(m[i], attn_row_max(tile_max));
            /* m_new is -inf only for a padding row past the sequence that saw no key yet. */
            const float alpha = m_new == -INFINITY ? 1.0f : expf(m[i] - m_new);
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < ATTN_PER_THREAD; j++) {
                const float p = m_new == -INFINITY ? 0.0f : expf(s[i][j] - m_new);
                sum += p;
                sp[(ty * R + i) * PLD + tx + ATTN_TX * j] = p;
            }
            l[i] = l[i] * alpha + attn_row_sum(sum);
            m[i] = m_new;
#pragma unroll
            for (int c = 0; c < COLS; c++) acc[i][c] *= alpha;
        }
        __syncthreads();

        attn_add_product(acc, sp, sv, keys, ty, tx, dim, ld);
    }

#pragma unroll
    for (int i = 0; i < R; i++) {
        const int r = ty * R + i;
        if (r >= tile.count) continue;
        const int64_t row = ((int64_t)tile.seq_start + tile.start + r) * sh.hq + h;
        const float inv = 1.0f / l[i];
#pragma unroll
        for (int c = 0; c < COLS; c++) {
            const int col = tx + ATTN_TX * c;
            if (col < dim) out[row * dim + col] = from_f32<T>(acc[i][c] * inv);
        }
        if (lse && tx == 0) lse[row] = m[i] + logf(l[i]);
    }
}

/* ---- backward --------------------------------------------------------------------- */

/* delta[row] = dout[row] . out[row] for every (token, q head) row: the softmax backward's
 * row term. One warp per row. */
template <typename T>
__global__ void attention_delta_kernel(float *__restrict__ delta, const T *__restrict__ dout,
                                       const T *__restrict__ out, int64_t rows, int dim) {
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; row < rows; row += warps) {
        float part = 0.0f;
        for (int c = lane; c < dim; c += 32) part += to_f32(dout[row * dim + c]) * to_f32(out[row * dim + c]);
        part = warp_sum(part);
        if (lane == 0) delta[row] = part;
    }
}

/* dst[i] += alpha * acc (read-modify-write of a gradient this thread alone owns). */
template <typename T>
__device__ __forceinline__ void attn_accumulate(T *dst, float value) {
    *dst = from_f32<T>(to_f32(*dst) + value);
}

/* Block (tile, q head): dq for R * 16 query rows, streaming their keys. For each pair,
 * p = exp(scale q.k - lse), ds = p (dout.v - delta); dq += scale * sum ds k. */
template <typename T, int DMAX, int R>
__global__ void __launch_bounds__(ATTN_THREADS)
attention_dq_kernel(T *dq, const T *__restrict__ dout, const T *__restrict__ q, const T *__restrict__ k,
                    const T *__restrict__ v, const float *__restrict__ lse, const float *__restrict__ delta,
                    const attn_tile *__restrict__ tiles, attn_shape sh) {
    constexpr int ROWS = ATTN_TY * R, COLS = DMAX / ATTN_TX, PLD = ATTN_BK + 1;
    extern __shared__ float attn_shared[];
    const int dim = sh.dim, ld = dim + 1;
    float *sq = attn_shared, *sdo = sq + ROWS * ld, *sk = sdo + ROWS * ld, *sv = sk + ATTN_BK * ld;
    float *sds = sv + ATTN_BK * ld;
    const attn_tile tile = tiles[blockIdx.x];
    const int h = blockIdx.y, kvh = h / (sh.hq / sh.hkv);
    const int ty = threadIdx.x / ATTN_TX, tx = threadIdx.x % ATTN_TX;
    const int64_t first = (int64_t)tile.seq_start + tile.start;

    attn_load_rows(sq, q, first, sh.hq, h, ROWS, tile.count, dim, ld);
    attn_load_rows(sdo, dout, first, sh.hq, h, ROWS, tile.count, dim, ld);
    float row_lse[R], row_delta[R], acc[R][COLS];
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int r = ty * R + i;
        row_lse[i] = r < tile.count ? lse[(first + r) * sh.hq + h] : 0.0f;
        row_delta[i] = r < tile.count ? delta[(first + r) * sh.hq + h] : 0.0f;
#pragma unroll
        for (int c = 0; c < COLS; c++) acc[i][c] = 0.0f;
    }

    const int last_query = tile.start + tile.count - 1;
    for (int k0 = 0; k0 <= last_query; k0 += ATTN_BK) {
        const int keys = min((int)ATTN_BK, tile.seq_len - k0);
        __syncthreads();
        attn_load_rows(sk, k, (int64_t)tile.seq_start + k0, sh.hkv, kvh, ATTN_BK, keys, dim, ld);
        attn_load_rows(sv, v, (int64_t)tile.seq_start + k0, sh.hkv, kvh, ATTN_BK, keys, dim, ld);
        __syncthreads();

        float s[R][ATTN_PER_THREAD], dp[R][ATTN_PER_THREAD];
        attn_dots(s, sq, sk, ty, tx, dim, ld);
        attn_dots(dp, sdo, sv, ty, tx, dim, ld);
#pragma unroll
        for (int i = 0; i < R; i++) {
            const int r = ty * R + i, query = tile.start + r;
#pragma unroll
            for (int j = 0; j < ATTN_PER_THREAD; j++) {
                const int key = k0 + tx + ATTN_TX * j;
                const bool live = r < tile.count && key <= query && key < tile.seq_len;
                const float p = live ? expf(s[i][j] * sh.scale - row_lse[i]) : 0.0f;
                sds[r * PLD + tx + ATTN_TX * j] = p * (dp[i][j] - row_delta[i]);
            }
        }
        __syncthreads();

        attn_add_product(acc, sds, sk, keys, ty, tx, dim, ld);
    }

#pragma unroll
    for (int i = 0; i < R; i++) {
        const int r = ty * R + i;
        if (r >= tile.count) continue;
        const int64_t row = (first + r) * sh.hq + h;
#pragma unroll
        for (int c = 0; c < COLS; c++) {
            const int col = tx + ATTN_TX * c;
            if (col < dim) attn_accumulate(&dq[row * dim + col], sh.scale * acc[i][c]);
        }
    }
}

/* Block (tile, kv head): dk and dv for R * 16 key rows, streaming the later queries of
 * every q head of the group in tiles of ATTN_BK. dv += sum p dout; dk += scale * sum ds q.
 * dk or dv may be NULL. */
template <typename T, int DMAX, int R>
__global__ void __launch_bounds__(ATTN_THREADS)
attention_dkv_kernel(T *dk, T *dv, const T *__restrict__ dout, const T *__restrict__ q,
                     const T *__restrict__ k, const T *__restrict__ v, const float *__restrict__ lse,
                     const float *__restrict__ delta, const attn_tile *__restrict__ tiles, attn_shape sh) {
    constexpr int ROWS = ATTN_TY * R, COLS = DMAX / ATTN_TX, PLD = ATTN_BK + 1;
    extern __shared__ float attn_shared[];
    const int dim = sh.dim, ld = dim + 1;
    float *sk = attn_shared, *sv = sk + ROWS * ld, *sq = sv + ROWS * ld, *sdo = sq + ATTN_BK * ld;
    float *sp = sdo + ATTN_BK * ld, *sds = sp + ROWS * PLD, *slse = sds + ROWS * PLD, *sdelta = slse + ATTN_BK;
    const attn_tile tile = tiles[blockIdx.x];
    const int kvh = blockIdx.y, group = sh.hq / sh.hkv;
    const int ty = threadIdx.x / ATTN_TX, tx = threadIdx.x % ATTN_TX;
    const int64_t first = (int64_t)tile.seq_start + tile.start;

    attn_load_rows(sk, k, first, sh.hkv, kvh, ROWS, tile.count, dim, ld);
    attn_load_rows(sv, v, first, sh.hkv, kvh, ROWS, tile.count, dim, ld);
    float acc_k[R][COLS], acc_v[R][COLS];
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int c = 0; c < COLS; c++) acc_k[i][c] = acc_v[i][c] = 0.0f;

    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        for (int q0 = tile.start; q0 < tile.seq_len; q0 += ATTN_BK) {
            const int queries = min((int)ATTN_BK, tile.seq_len - q0);
            const int64_t qfirst = (int64_t)tile.seq_start + q0;
            __syncthreads(); /* the previous tile's sq, sdo, sp, sds are no longer read */
            attn_load_rows(sq, q, qfirst, sh.hq, h, ATTN_BK, queries, dim, ld);
            attn_load_rows(sdo, dout, qfirst, sh.hq, h, ATTN_BK, queries, dim, ld);
            for (int j = threadIdx.x; j < ATTN_BK; j += ATTN_THREADS) {
                slse[j] = j < queries ? lse[(qfirst + j) * sh.hq + h] : 0.0f;
                sdelta[j] = j < queries ? delta[(qfirst + j) * sh.hq + h] : 0.0f;
            }
            __syncthreads();

            float s[R][ATTN_PER_THREAD], dp[R][ATTN_PER_THREAD];
            attn_dots(s, sk, sq, ty, tx, dim, ld);
            attn_dots(dp, sv, sdo, ty, tx, dim, ld);
#pragma unroll
            for (int i = 0; i < R; i++) {
                const int r = ty * R + i, key = tile.start + r;
#pragma unroll
                for (int j = 0; j < ATTN_PER_THREAD; j++) {
                    const int jj = tx + ATTN_TX * j, query = q0 + jj;
                    const bool live = r < tile.count && jj < queries && key <= query;
                    const float p = live ? expf(s[i][j] * sh.scale - slse[jj]) : 0.0f;
                    sp[r * PLD + jj] = p;
                    sds[r * PLD + jj] = p * (dp[i][j] - sdelta[jj]);
                }
            }
            __syncthreads();

            attn_add_product(acc_k, sds, sq, queries, ty, tx, dim, ld);
            attn_add_product(acc_v, sp, sdo, queries, ty, tx, dim, ld);
        }
    }

#pragma unroll
    for (int i = 0; i < R; i++) {
        const int r = ty * R + i;
        if (r >= tile.count) continue;
        const int64_t row = (first + r) * sh.hkv + kvh;
#pragma unroll
        for (int c = 0; c < COLS; c++) {
            const int col = tx + ATTN_TX * c;
            if (col >= dim) continue;
            if (dk) attn_accumulate(&dk[row * dim + col], sh.scale * acc_k[i][c]);
            if (dv) attn_accumulate(&dv[row * dim + col], acc_v[i][c]);
        }
    }
}

#endif
