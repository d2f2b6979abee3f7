/* The CUDA backend's table, its device probe, and its memory functions.
 *
 * The device is the calling thread's current one (device 0 unless the process chose
 * another with cudaSetDevice or CUDA_VISIBLE_DEVICES). Memory comes from cudaMalloc and
 * is zeroed on the default stream before any later op can read it. */
#include "kernels/cuda/cuda.cuh" // defines: the cuda_* functions of every op

/* Writes a known value: proves that this binary carries code the device can run (it is
 * built for one architecture, CUDA_ARCH in the Makefile). */
__global__ void probe_kernel(int *out) { *out = 0x5e17; }

static bool probe_fail(const char *why, cudaError_t e) {
    (void)cudaGetLastError();
    log_debug("cuda: no usable device: %s: %s", why, cudaGetErrorString(e));
    return false;
}

/* Never aborts: without a driver, cudaGetDeviceCount returns an error and we say no. */
extern "C" bool cuda_backend_probe(void) {
    int count = 0, device = 0, pools = 0, seen = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) return probe_fail("cudaGetDeviceCount", e);
    if (count <= 0) {
        log_debug("cuda: no usable device: no CUDA devices");
        return false;
    }
    if ((e = cudaGetDevice(&device)) != cudaSuccess) return probe_fail("cudaGetDevice", e);
    cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess)
        return probe_fail("cudaGetDeviceProperties", e);
    /* Scratch buffers come from the stream-ordered allocator (common.cuh). */
    e = cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device);
    if (e != cudaSuccess) return probe_fail("cudaDeviceGetAttribute", e);
    if (!pools) {
        log_warn("cuda: device %d (%s) has no stream-ordered allocator; not using it", device, prop.name);
        return false;
    }
    /* Keep freed scratch in the pool instead of returning it to the driver at every
     * synchronisation: ops take and release small buffers on every call. */
    cudaMemPool_t pool;
    uint64_t keep = UINT64_MAX;
    if ((e = cudaDeviceGetDefaultMemPool(&pool, device)) != cudaSuccess)
        return probe_fail("cudaDeviceGetDefaultMemPool", e);
    if ((e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep)) != cudaSuccess)
        return probe_fail("cudaMemPoolSetAttribute", e);
    int *flag = nullptr;
    if ((e = cudaMalloc(&flag, sizeof *flag)) != cudaSuccess) return probe_fail("cudaMalloc", e);
    probe_kernel<<<1, 1>>>(flag);
    e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpy(&seen, flag, sizeof seen, cudaMemcpyDeviceToHost);
    (void)cudaFree(flag);
    if (e != cudaSuccess || seen != 0x5e17) {
        log_warn("cuda: device %d (%s, sm_%d%d) cannot run this build's kernels: %s", device,
                 prop.name, prop.major, prop.minor, cudaGetErrorString(e));
        (void)cudaGetLastError();
        return false;
    }
    log_info("cuda: device %d: %s, sm_%d%d, %d SMs, %zu MiB", device, prop.name, prop.major,
             prop.minor, prop.multiProcessorCount, prop.totalGlobalMem >> 20);
    return true;
}

/* ---- memory ----------------------------------------------------------------------- */

static int cuda_alloc(void **ptr, size_t bytes, struct smelt_error *err) {
    void *p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return error_set(err, e == cudaErrorMemoryAllocation ? SMELT_ENOMEM : SMELT_EBACKEND,
                         "cuda: cannot allocate %zu bytes: %s", bytes, cudaGetErrorString(e));
    }
    e = cudaMemset(p, 0, bytes);
    if (e != cudaSuccess) {
        (void)cudaFree(p);
        return cuda_error(err, "cuda: allocating", "cudaMemset", e);
    }
    *ptr = p;
    return SMELT_OK;
}

static void cuda_free(void *ptr) {
    /* cudaFree waits for the device; an error here belongs to earlier work and has
     * nowhere to go, so it is cleared rather than left for an unrelated op to report. */
    if (cudaFree(ptr) != cudaSuccess) (void)cudaGetLastError();
}

static int cuda_zero(void *ptr, size_t bytes, struct smelt_error *err) {
    CUDA_TRY(err, "tensor_zero", cudaMemset(ptr, 0, bytes));
    return SMELT_OK;
}

static int cuda_copy_to_host(void *host_dst, const void *src, size_t bytes, struct smelt_error *err) {
    CUDA_TRY(err, "tensor_copy", cudaMemcpy(host_dst, src, bytes, cudaMemcpyDeviceToHost));
    return SMELT_OK;
}

static int cuda_copy_from_host(void *dst, const void *host_src, size_t bytes, struct smelt_error *err) {
    CUDA_TRY(err, "tensor_copy", cudaMemcpy(dst, host_src, bytes, cudaMemcpyHostToDevice));
    return SMELT_OK;
}

/* memmove semantics, as on the CPU: cudaMemcpy's result is undefined for overlapping
 * ranges, so those go through a scratch buffer. */
static int cuda_copy_within(void *dst, const void *src, size_t bytes, struct smelt_error *err) {
    if (dst == src) return SMELT_OK;
    const char *d = (const char *)dst, *s = (const char *)src;
    if (d < s + bytes && s < d + bytes) {
        cuda_scratch tmp;
        if (int rc = tmp.alloc(bytes, "tensor_copy", err)) return rc;
        CUDA_TRY(err, "tensor_copy", cudaMemcpyAsync(tmp.ptr, src, bytes, cudaMemcpyDeviceToDevice, 0));
        CUDA_TRY(err, "tensor_copy", cudaMemcpyAsync(dst, tmp.ptr, bytes, cudaMemcpyDeviceToDevice, 0));
        return SMELT_OK;
    }
    CUDA_TRY(err, "tensor_copy", cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
    return SMELT_OK;
}

static int cuda_sync(struct smelt_error *err) {
    CUDA_TRY(err, "backend_sync", cudaDeviceSynchronize());
    return SMELT_OK;
}

/* ---- the table -------------------------------------------------------------------- */

/* Filled by name (C++17 has no designated initialisers); runs during static
 * initialisation, before main. */
static struct backend_ops cuda_table(void) {
    struct backend_ops t = {};
    t.name = "cuda";
    t.compute_dtypes = (1u << DTYPE_F32) | (1u << DTYPE_BF16);
    t.alloc = cuda_alloc;
    t.free = cuda_free;
    t.zero = cuda_zero;
    t.copy_to_host = cuda_copy_to_host;
    t.copy_from_host = cuda_copy_from_host;
    t.copy_within = cuda_copy_within;
    t.sync = cuda_sync;
    t.matmul = cuda_matmul;
    t.matmul_backward = cuda_matmul_backward;
    t.embedding = cuda_embedding;
    t.embedding_backward = cuda_embedding_backward;
    t.rmsnorm = cuda_rmsnorm;
    t.rmsnorm_backward = cuda_rmsnorm_backward;
    t.layernorm = cuda_layernorm;
    t.layernorm_backward = cuda_layernorm_backward;
    t.rope = cuda_rope;
    t.rope_backward = cuda_rope_backward;
    t.attention = cuda_attention;
    t.attention_backward = cuda_attention_backward;
    t.kv_append = cuda_kv_append;
    t.paged_attention = cuda_paged_attention;
    t.swiglu = cuda_swiglu;
    t.swiglu_backward = cuda_swiglu_backward;
    t.gelu = cuda_gelu;
    t.gelu_backward = cuda_gelu_backward;
    t.add = cuda_add;
    t.accumulate = cuda_accumulate;
    t.logprobs = cuda_logprobs;
    t.argmax = cuda_argmax;
    t.logprobs_backward = cuda_logprobs_backward;
    t.adamw = cuda_adamw;
    t.sum_squares = cuda_sum_squares;
    t.cast = cuda_cast;
    return t;
}

/* Declared extern "C" in kernels/backend.h. */
const struct backend_ops cuda_backend_ops = cuda_table();
